//! `medea rollout list|status|halt`: follow and stop rollout jobs on a running server.

use miette::{IntoDiagnostic as _, WrapErr as _};
use std::io::IsTerminal;

use clap::{Args, Subcommand};

use super::client::{ClientArgs, rpc_error};
use super::exit;
use super::output::{self, Format};
use crate::api::pb;

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub action: RolloutAction,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Subcommand)]
pub enum RolloutAction {
    /// Every rollout job, newest first.
    #[command(
        after_help = "Examples:\n  medea rollout list\n  medea rollout list --cluster prod -o json"
    )]
    List {
        /// Only the jobs of this cluster; an unknown name is an error.
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// The newest job of a cluster, node by node; with -w, follow it live until it ends.
    #[command(
        after_help = "Examples:\n  medea rollout status\n  medea rollout status --cluster prod --pool workers -w\n  medea rollout status 1a2b3c4d5e6f-prod\n\nWithout a job id: the newest job of --cluster, which may be left out when the server knows one cluster. With -w the exit status is 0 when the job succeeds and 1 when it halts."
    )]
    Status {
        /// The job to show (`medea rollout list` lists them); default: the cluster's newest.
        #[arg(add = super::complete::jobs())]
        job: Option<String>,
        /// The cluster whose newest job to show (default: the only cluster, when there is one).
        #[arg(long, add = super::complete::clusters())]
        cluster: Option<String>,
        /// Only the nodes of this node pool.
        #[arg(long, add = super::complete::pools())]
        pool: Option<String>,
        /// Follow the job until it succeeds or halts.
        #[arg(short = 'w', long)]
        watch: bool,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
        /// With -w and no TTY: one readable line per event (local time), or one JSON object
        /// per event.
        #[arg(long, value_enum, default_value_t = super::LogFormat::Text)]
        log_format: super::LogFormat,
    },
    /// Stop a job before its next mutating command. A halted job never continues by itself.
    #[command(
        after_help = "Examples:\n  medea rollout halt 1a2b3c4d5e6f-prod --reason 'latency spike on canary'"
    )]
    Halt {
        /// The job to halt (`medea rollout list` lists them).
        #[arg(add = super::complete::jobs())]
        job: String,
        /// Why, recorded in the job's journal and shown by `rollout status`.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Continue a job an inconclusive health gate paused (`onInconclusive: pause`): its gates
    /// are checked again with fresh counts. A halted job is not resumed: it needs a new plan.
    #[command(after_help = "Examples:\n  medea rollout resume 1a2b3c4d5e6f-prod")]
    Resume {
        /// The paused job (`medea rollout status` says when a job is paused).
        #[arg(add = super::complete::jobs())]
        job: String,
    },
}

fn runtime() -> miette::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new()
        .into_diagnostic()
        .wrap_err("cannot start the runtime")
}

pub fn run(args: RolloutArgs) -> miette::Result<u8> {
    let addr = args.client.addr();
    runtime()?.block_on(async move {
        let mut c = args.client.connect().await?;
        let rpc = |s| rpc_error(&addr, s);
        match args.action {
            RolloutAction::List { cluster, output: fmt } => {
                let r = c.list_rollouts(pb::ListRolloutsRequest { cluster: cluster.unwrap_or_default() }).await.map_err(rpc)?.into_inner();
                let text = match fmt {
                    Format::Json => output::json(&r.rollouts),
                    Format::Yaml => output::yaml(&r.rollouts),
                    Format::Table | Format::Wide => output::table(
                        &["JOB", "CLUSTER", "PLAN", "STATE", "NODE UPGRADES", "CURRENT", "CREATED"],
                        &r.rollouts
                            .iter()
                            .map(|j| {
                                vec![
                                    j.job_id.clone(),
                                    j.cluster.clone(),
                                    j.plan_id[..12.min(j.plan_id.len())].to_string(),
                                    if j.halt_reason.is_empty() { j.state.clone() } else { format!("halted: {}", j.halt_reason) },
                                    format!("{}/{}", j.nodes_done, j.nodes_total),
                                    if j.current_step.is_empty() { "-".into() } else { j.current_step.clone() },
                                    output::when(&j.created_at),
                                ]
                            })
                            .collect::<Vec<_>>(),
                    ),
                };
                out!("{text}");
                Ok(exit::OK)
            }
            RolloutAction::Halt { job, reason } => {
                let r = c.halt_rollout(pb::HaltRolloutRequest { job_id: job.clone(), reason: reason.unwrap_or_default() }).await.map_err(rpc)?.into_inner();
                let state = r.rollout.map(|r| r.state).unwrap_or_default();
                outln!("halt requested for {job} (state: {state}); it stops before its next mutating command and never continues by itself.");
                outln!("Follow it to its stop: medea rollout status {job} -w");
                outln!("Once it has stopped, the server plans what is left; approving that plan continues the rollout (medea plan).");
                Ok(exit::OK)
            }
            RolloutAction::Resume { job } => {
                c.resume_rollout(pb::ResumeRolloutRequest { job_id: job.clone() }).await.map_err(rpc)?;
                outln!("resume requested for {job}: its health gates are checked again at its next round.");
                outln!("Follow it: medea rollout status {job} -w");
                Ok(exit::OK)
            }
            RolloutAction::Status { job, cluster, pool, watch, output: fmt, log_format } => {
                let cluster = match (&job, cluster) {
                    (_, Some(c)) => c,
                    // A job id names its cluster; every job is searched.
                    (Some(_), None) => String::new(),
                    (None, None) => {
                        let clusters = c.list_clusters(pb::ListClustersRequest {}).await.map_err(rpc)?.into_inner().clusters;
                        only_cluster(clusters.iter().map(|c| c.name.as_str()))?
                    }
                };
                let jobs = c.list_rollouts(pb::ListRolloutsRequest { cluster: cluster.clone() }).await.map_err(rpc)?.into_inner().rollouts;
                let job = match job {
                    Some(id) => jobs.into_iter().find(|j| j.job_id == id).ok_or_else(|| {
                        miette::miette!(help = "`medea rollout list` lists the jobs", "no rollout job `{id}`")
                    })?,
                    None => match jobs.into_iter().next() {
                        Some(j) => j,
                        None => {
                            outln!("cluster {cluster} has no rollout jobs");
                            return Ok(exit::OK);
                        }
                    },
                };
                if !watch {
                    out!("{}", render_status(&job, pool.as_deref(), fmt));
                    if job.state == "halted" && matches!(fmt, Format::Table | Format::Wide) {
                        out!("{}", after_halt(&mut c, &job, false).await);
                    }
                    return Ok(if job.state == "halted" { exit::ERROR } else { exit::OK });
                }
                follow(&mut c, &addr, job, pool.as_deref(), log_format).await
            }
        }
    })
}

/// How long a follower waits for the server to plan again after a halt before it says it has
/// not yet (the server plans again at the refresh the halt starts: seconds).
const REPLAN_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Where the server's current plan stands to a halted job (issue #52 item 1): the server
/// records in a plan's basis the job running (`basis.running`) or halted (`basis.halted`) in
/// each cluster when it planned, so a follower knows which plan comes after the halt.
#[derive(Debug, PartialEq, Eq)]
enum AfterHalt {
    /// Planned before the halt (the job's own plan, or one computed while the job ran).
    Before,
    /// Planned after the halt: it continues from what the job left.
    After,
    /// Planned later still (a newer job, another change): shown as it is.
    Later,
}

fn after_halt_of(plan: &crate::plan::Plan, job: &pb::Rollout) -> AfterHalt {
    let mine = |m: &std::collections::BTreeMap<String, String>| {
        m.get(&job.cluster).is_some_and(|j| *j == job.job_id)
    };
    if plan.id.to_hex() == job.plan_id || mine(&plan.basis.running) {
        AfterHalt::Before
    } else if mine(&plan.basis.halted) {
        AfterHalt::After
    } else {
        AfterHalt::Later
    }
}

/// The server's current plan and where it stands to the halted `job`; with `wait`, the plan
/// that comes after the halt, waited for until [`REPLAN_PATIENCE`].
async fn plan_after_halt(
    c: &mut super::client::Client,
    job: &pb::Rollout,
    wait: bool,
) -> Option<(pb::Plan, Option<crate::plan::Plan>, AfterHalt)> {
    let deadline = tokio::time::Instant::now() + REPLAN_PATIENCE;
    loop {
        let p = c
            .get_plan(pb::GetPlanRequest { id: String::new() })
            .await
            .ok()?
            .into_inner()
            .plan?;
        let plan = serde_json::from_str::<crate::plan::Plan>(&p.json).ok();
        let at = match &plan {
            Some(plan) => after_halt_of(plan, job),
            None if p.id == job.plan_id => AfterHalt::Before,
            None => AfterHalt::Later,
        };
        if at != AfterHalt::Before || !wait || tokio::time::Instant::now() >= deadline {
            return Some((p, plan, at));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// What follows a halt, for a person reading the job's status: nothing resumes it by itself;
/// the server's current plan carries what is left, and how many approvals it needs. With
/// `wait` (a follower), the plan that comes after the halt is waited for, so the output never
/// shows the plan computed while the job ran (issue #52).
async fn after_halt(c: &mut super::client::Client, job: &pb::Rollout, wait: bool) -> String {
    let head = "next: a halted job never continues by itself";
    let Some((p, plan, at)) = plan_after_halt(c, job, wait).await else {
        return format!(
            "{head}; `medea plan` shows what is left once the server has planned again.\n"
        );
    };
    if at == AfterHalt::Before {
        return format!(
            "{head}; the server has not planned again since the halt yet: `medea plan` shows what is left once it has.\n"
        );
    }
    let summary = plan
        .as_ref()
        .map(crate::plan::render::summary_line)
        .unwrap_or_else(|| format!("Plan {}", p.short_id));
    if !p.has_changes {
        return format!(
            "{head}, and the server's current plan has nothing left to do:\n  {summary}\n"
        );
    }
    let continues = if at == AfterHalt::After {
        "continues from what is left (nodes already on their target are not in it)"
    } else {
        "was planned since (a newer change or job)"
    };
    format!(
        "{head}. The server's current plan {continues} and needs {} approval{} (has {}):\n  {summary}\n  read it first: medea plan\n",
        p.approvals_required,
        if p.approvals_required == 1 { "" } else { "s" },
        p.approvals.len()
    )
}

/// The cluster to use when none was named: the only one the server knows, else an error that
/// lists them.
pub(crate) fn only_cluster<'a>(names: impl Iterator<Item = &'a str>) -> miette::Result<String> {
    let names: Vec<&str> = names.collect();
    match names.as_slice() {
        [one] => Ok((*one).to_string()),
        [] => Err(miette::miette!("the server knows no cluster yet")),
        many => Err(miette::miette!(
            help = format!("pass --cluster with one of: {}", many.join(", ")),
            "the server knows {} clusters: say which",
            many.len()
        )),
    }
}

fn render_status(job: &pb::Rollout, pool: Option<&str>, fmt: Format) -> String {
    let nodes: Vec<&pb::NodeProgress> = job
        .nodes
        .iter()
        .filter(|n| pool.is_none_or(|p| n.pool == p))
        .collect();
    match fmt {
        Format::Json => output::json(job),
        Format::Yaml => output::yaml(job),
        Format::Table | Format::Wide => {
            let mut s = format!(
                "job {} (cluster {}, plan {}): {}{}\n",
                job.job_id,
                job.cluster,
                &job.plan_id[..12.min(job.plan_id.len())],
                job.state,
                if job.halt_reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", job.halt_reason)
                }
            );
            if !job.current_step.is_empty() {
                s.push_str(&format!("{}\n", job.current_step));
            }
            if !job.waiting_for.is_empty() {
                s.push_str(&format!(
                    "waiting: {}{}\n",
                    job.waiting_for,
                    job.waiting_since
                        .parse::<jiff::Timestamp>()
                        .map(|t| format!(" (since {})", t.strftime("%H:%M:%S UTC")))
                        .unwrap_or_default()
                ));
            }
            if let Some(line) = duration_line(job) {
                s.push_str(&line);
            }
            if !job.gate_point.is_empty() {
                s.push_str(&format!(
                    "health gates: checking {}{}\n",
                    job.gate_point,
                    soak_countdown(job, jiff::Timestamp::now())
                ));
            }
            s.push_str(&output::table(
                &["STEP", "POOL", "NODE", "STATE"],
                &nodes
                    .iter()
                    .map(|n| {
                        vec![
                            n.step.clone(),
                            if n.pool.is_empty() {
                                "-".into()
                            } else {
                                n.pool.clone()
                            },
                            n.node.clone(),
                            n.state.clone(),
                        ]
                    })
                    .collect::<Vec<_>>(),
            ));
            s.push_str(&gate_table(job));
            s.push_str(&staged_lines(&nodes));
            s
        }
    }
}

/// The nodes installed ahead (`rollout.stage: ahead`) that have not rebooted into the target:
/// what their next boot does, planned or not (issue #36). The server marks them in their state
/// (`…, staged: any reboot boots v1.13.9`).
fn staged_lines(nodes: &[&pb::NodeProgress]) -> String {
    let staged: Vec<String> = nodes
        .iter()
        .filter_map(|n| {
            n.state
                .split_once(", staged: any reboot boots ")
                .map(|(_, v)| format!("  {}: its next boot, planned or not, boots {v}\n", n.node))
        })
        .collect();
    if staged.is_empty() {
        return String::new();
    }
    format!(
        "installed ahead, not rebooted yet ({}; to undo one before it reboots: talosctl rollback):\n{}",
        staged.len(),
        staged.concat()
    )
}

/// `duration: elapsed …, predicted median …, pessimistic …` when the plan predicted the job's
/// duration (issue #36), elapsed by the job's clock (issue #51: from its first command, less its
/// waits for windows and exclusions), as the server read it.
fn duration_line(job: &pb::Rollout) -> Option<String> {
    if job.predicted_pessimistic_seconds == 0 {
        return None;
    }
    let bounds = crate::plan::estimate::Bounds {
        median_secs: job.predicted_median_seconds,
        pessimistic_secs: job.predicted_pessimistic_seconds,
    };
    let reading = crate::rollout::sequencer::ClockReading::from_wire(
        job.active_seconds,
        !job.started_at.is_empty(),
        job.paused_since.parse().ok(),
    );
    Some(format!("duration: {}\n", reading.progress(bounds)))
}

/// `, soak ends in 4m 10s (at …)`, or which gate holds it and its verdict
/// ([`crate::rollout::sequencer::holding_phrase`]), for the status line.
fn soak_countdown(job: &pb::Rollout, now: jiff::Timestamp) -> String {
    match job.soak_ends_at.parse::<jiff::Timestamp>() {
        Ok(end) if end > now => {
            let left = std::time::Duration::try_from(end.duration_since(now)).unwrap_or_default();
            format!(
                ", soak ends in {} (at {end}) if every gate keeps passing",
                crate::duration::Duration::from(std::time::Duration::from_secs(left.as_secs()))
            )
        }
        Ok(_) => ", soak complete at the next evaluation".into(),
        Err(_) => crate::rollout::sequencer::holding_phrase(
            job.gates
                .iter()
                .filter(|g| g.point == job.gate_point)
                .filter_map(|g| {
                    crate::rollout::ports::GateVerdict::parse(&g.verdict)
                        .map(|v| (g.gate.as_str(), v, g.dry_run))
                }),
        ),
    }
}

/// The gates' latest evaluations, as a table (none: empty).
fn gate_table(job: &pb::Rollout) -> String {
    if job.gates.is_empty() {
        return String::new();
    }
    output::table(
        &["GATE", "WHERE", "VERDICT", "AT", "DETAIL"],
        &job.gates
            .iter()
            .map(|g| {
                let samples = g
                    .samples
                    .iter()
                    .take(3)
                    .map(|s| {
                        let mut l: Vec<String> =
                            s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        l.sort();
                        format!("{{{}}} {}", l.join(","), s.value)
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                vec![
                    g.gate.clone(),
                    g.point.clone(),
                    if g.dry_run {
                        format!("{} (dry run)", g.verdict)
                    } else {
                        g.verdict.clone()
                    },
                    output::when(&g.at),
                    if samples.is_empty() {
                        g.detail.clone()
                    } else {
                        format!("{} [{samples}]", g.detail)
                    },
                ]
            })
            .collect::<Vec<_>>(),
    )
}

/// Readable progress for a follower without a TTY (CI logs, `| tee`): one line per meaningful
/// event, `12:03:01 cp-1  upgraded to v1.13.9, Ready (1/6 node upgrades, step 1/3)`, in local
/// time to the second; a line that repeats its subject's last line is dropped. The count is the
/// job's node upgrades, one per node per step ([`crate::rollout::sequencer::NODE_UPGRADES`]),
/// as `rollout list` and the dashboard count them (issue #52).
pub struct EventLines {
    tz: jiff::tz::TimeZone,
    last: std::collections::HashMap<String, String>,
    /// Node upgrades seen done (back on their target, or skipped), by step and node, for
    /// "(n/total node upgrades)".
    upgraded: std::collections::HashSet<(u32, String)>,
}

impl EventLines {
    pub fn new(tz: jiff::tz::TimeZone) -> EventLines {
        EventLines {
            tz,
            last: Default::default(),
            upgraded: Default::default(),
        }
    }

    /// The line for `e`, given the job as it is after `e`; `None` when the event is not worth
    /// a line of its own (a "done" the next line implies) or repeats the last one.
    pub fn line(&mut self, e: &pb::RolloutEvent, job: &pb::Rollout) -> Option<String> {
        if e.state == "progress"
            && let Some((name, rest)) = e.message.split_once(": ")
            && (rest.starts_with("back on ")
                || (rest.starts_with("already runs ") && rest.ends_with(", skipped")))
        {
            self.upgraded.insert((e.step_number, name.to_string()));
        }
        let (subject, text) = describe(e, job, self.upgraded.len())?;
        if self.last.get(&subject) == Some(&text) {
            return None;
        }
        self.last.insert(subject.clone(), text.clone());
        let time =
            e.at.parse::<jiff::Timestamp>()
                .map(|t| t.to_zoned(self.tz.clone()).strftime("%H:%M:%S").to_string())
                .unwrap_or_else(|_| e.at.clone());
        let width = job
            .nodes
            .iter()
            .map(|n| n.node.len())
            .chain([job.cluster.len(), subject.len()])
            .max()
            .unwrap_or(0);
        Some(format!("{time} {subject:<width$}  {text}"))
    }
}

/// `(subject, text)` of an event: the node it is about, else the cluster.
fn describe(e: &pb::RolloutEvent, job: &pb::Rollout, upgraded: usize) -> Option<(String, String)> {
    let cluster = if e.cluster.is_empty() {
        job.cluster.clone()
    } else {
        e.cluster.clone()
    };
    let subject = if e.node.is_empty() {
        cluster.clone()
    } else {
        e.node.clone()
    };
    let step = (e.step_number > 0 && e.steps_total > 0)
        .then(|| format!("step {}/{}", e.step_number, e.steps_total));
    let image = |verb: &str| {
        if e.image.is_empty() {
            verb.to_string()
        } else {
            format!("{verb} {}", e.image)
        }
    };
    let text = match e.state.as_str() {
        "intended" => {
            let mut what = match e.step.as_str() {
                "pull" => image("pulling"),
                "upgrade" => image("upgrading to"),
                "set-image" => image("setting the image"),
                "etcd-snapshot" => "saving an etcd snapshot".to_string(),
                "cordon" => "cordoning".to_string(),
                "drain" => "draining".to_string(),
                "reboot" => "rebooting".to_string(),
                "forfeit-leadership" => "handing etcd leadership over".to_string(),
                "uncordon" => "uncordoning".to_string(),
                "apply-manifests" => "applying the manifests".to_string(),
                other => other.to_string(),
            };
            let attempt: u32 = e
                .message
                .strip_prefix("attempt ")
                .and_then(|a| a.parse().ok())
                .unwrap_or(1);
            if attempt > 1 {
                what.push_str(&format!(" (attempt {attempt})"));
            }
            what
        }
        // The next line (or the node's completion) says what followed.
        "done" => return None,
        "unknown" => format!("{}: outcome unknown ({}); observing", e.step, e.message),
        "progress" => return progress(e, job, &cluster, step.as_deref(), upgraded),
        "waiting" => format!("waiting: {}", e.message),
        "paused" => format!("paused: {}", e.message),
        "halted" => format!("HALTED: {}", e.message),
        "failed" => format!("failed: {}", e.message),
        "succeeded" => "rollout succeeded".to_string(),
        _ if e.message.is_empty() => e.state.clone(),
        _ => format!("{}: {}", e.state, e.message),
    };
    Some((subject, text))
}

/// A progress note of the state machine (`cp-1: back on v1.13.9, healthy and Ready`,
/// `step 0 started`, …) as a line about its node or its cluster.
fn progress(
    e: &pb::RolloutEvent,
    job: &pb::Rollout,
    cluster: &str,
    step: Option<&str>,
    upgraded: usize,
) -> Option<(String, String)> {
    let note = e.message.as_str();
    if let Some((name, rest)) = note.split_once(": ")
        && job.nodes.iter().any(|n| n.node == name)
    {
        let text = match rest
            .strip_prefix("back on ")
            .and_then(|r| r.split_once(", "))
        {
            Some((version, _)) => {
                let mut t = format!(
                    "upgraded to {version}, Ready ({upgraded}/{} {}",
                    job.nodes_total,
                    crate::rollout::sequencer::NODE_UPGRADES
                );
                if let Some(s) = step {
                    t.push_str(&format!(", {s}"));
                }
                t.push(')');
                t
            }
            None => rest.to_string(),
        };
        return Some((name.to_string(), text));
    }
    // Job-level notes the terminal event says again.
    if note == "job succeeded" || note.starts_with("halted: ") {
        return None;
    }
    // `step <index> started|done` (0-based): "done" is implied by the next step's start or
    // by the job's end.
    let words: Vec<&str> = note.split(' ').collect();
    if let ["step", index, what @ ("started" | "done")] = words.as_slice() {
        if *what == "done" {
            return None;
        }
        let label = job
            .current_step
            .split_once(": ")
            .map(|(_, l)| format!(": {l}"))
            .unwrap_or_default();
        let number = match (index.parse::<u32>(), e.steps_total) {
            (Ok(i), total) if total > 0 => format!("step {}/{total}", i + 1),
            _ => step.unwrap_or("step").to_string(),
        };
        return Some((cluster.to_string(), format!("{number} started{label}")));
    }
    Some((cluster.to_string(), note.to_string()))
}

/// Follow a job: progress bars per node on a TTY, one line per event otherwise.
#[allow(
    clippy::expect_used,
    reason = "a constant indicatif template, and events that are plain structs with string keys"
)]
pub(crate) async fn follow(
    c: &mut super::client::Client,
    addr: &str,
    job: pb::Rollout,
    pool: Option<&str>,
    log_format: super::LogFormat,
) -> miette::Result<u8> {
    let tty = std::io::stdout().is_terminal();
    // Events journaled before now are the replay: shown as lines even on a terminal.
    let started = jiff::Timestamp::now();
    let mut events = c
        .watch_rollout(pb::WatchRolloutRequest {
            job_id: job.job_id.clone(),
            cluster: String::new(),
            replay: true,
        })
        .await
        .map_err(|s| rpc_error(addr, s))?
        .into_inner();
    let mut lines = EventLines::new(jiff::tz::TimeZone::system());
    let shown = |e: &pb::RolloutEvent| pool.is_none_or(|p| e.pool.is_empty() || e.pool == p);
    let print = |lines: &mut EventLines, e: &pb::RolloutEvent, job: &pb::Rollout| match log_format {
        super::LogFormat::Json => Some(serde_json::to_string(e).expect("events serialize")),
        super::LogFormat::Text => lines.line(e, job),
    };
    if job.state != "running" {
        // A finished job: its journal, then its state (the stream ends after the replay).
        while let Some(e) = events.message().await.map_err(|s| rpc_error(addr, s))? {
            if shown(&e)
                && let Some(l) = print(&mut lines, &e, &job)
            {
                outln!("{l}");
            }
        }
        out!("{}", render_status(&job, pool, Format::Table));
        if job.state == "halted" {
            out!("{}", after_halt(c, &job, true).await);
        }
        return Ok(if job.state == "succeeded" {
            exit::OK
        } else {
            exit::ERROR
        });
    }
    let bars = tty.then(indicatif::MultiProgress::new);
    let mut per_node: std::collections::BTreeMap<String, indicatif::ProgressBar> =
        Default::default();
    let style = indicatif::ProgressStyle::with_template("{prefix:>12} {spinner} {wide_msg}")
        .expect("static template");
    let mut current = job;
    loop {
        // Draw the current state.
        for n in current
            .nodes
            .iter()
            .filter(|n| pool.is_none_or(|p| n.pool == p))
        {
            if let Some(b) = &bars {
                let bar = per_node.entry(n.node.clone()).or_insert_with(|| {
                    let pb = b.add(indicatif::ProgressBar::new_spinner());
                    pb.set_style(style.clone());
                    pb.set_prefix(n.node.clone());
                    pb
                });
                bar.set_message(format!("step {} {}", n.step, n.state));
                if n.state == "done" || n.state == "skipped" {
                    bar.finish();
                } else {
                    bar.tick();
                }
            }
        }
        if current.state != "running" {
            if let Some(b) = &bars {
                let _ = b.clear();
            }
            out!("{}", render_status(&current, pool, Format::Table));
            if current.state == "halted" {
                out!("{}", after_halt(c, &current, true).await);
            }
            return Ok(if current.state == "succeeded" {
                exit::OK
            } else {
                exit::ERROR
            });
        }
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), events.message()).await;
        let event = match next {
            Ok(Ok(Some(e))) => Some(e),
            Err(_) => None,
            Ok(Ok(None)) => return Err(miette::miette!("the server closed the event stream")),
            Ok(Err(s)) => return Err(rpc_error(addr, s)),
        };
        // The job as it is after the event, for the counts its line shows.
        let r = c
            .list_rollouts(pb::ListRolloutsRequest {
                cluster: current.cluster.clone(),
            })
            .await
            .map_err(|s| rpc_error(addr, s))?
            .into_inner();
        if let Some(j) = r.rollouts.into_iter().find(|j| j.job_id == current.job_id) {
            current = j;
        }
        let replayed =
            |e: &pb::RolloutEvent| e.at.parse::<jiff::Timestamp>().is_ok_and(|t| t < started);
        if let Some(e) = event.filter(|e| (!tty || replayed(e)) && shown(e))
            && let Some(l) = print(&mut lines, &e, &current)
        {
            match &bars {
                Some(b) => {
                    let _ = b.println(l);
                }
                None => outln!("{l}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_the_soak_countdown_and_the_gates_evidence() {
        let now: jiff::Timestamp = "2026-12-03T12:00:00Z".parse().unwrap();
        let counting = pb::Rollout {
            soak_ends_at: "2026-12-03T12:04:10Z".into(),
            ..Default::default()
        };
        assert_eq!(
            soak_countdown(&counting, now),
            ", soak ends in 4m10s (at 2026-12-03T12:04:10Z) if every gate keeps passing"
        );
        let mut job = pb::Rollout {
            job_id: "abc-prod".into(),
            plan_id: "abcdef0123456789".into(),
            cluster: "prod".into(),
            state: "running".into(),
            gate_point: "soak after wave 1 of step 1".into(),
            soak_ends_at: String::new(),
            gates: vec![
                pb::GateResult {
                    gate: "ingress-errors".into(),
                    point: "soak after wave 1 of step 1".into(),
                    verdict: "fail".into(),
                    detail: "the query returned a 0 sample".into(),
                    at: "2026-12-03T11:59:30Z".into(),
                    samples: vec![pb::GateSample {
                        labels: [("ingress".to_string(), "web".to_string())].into(),
                        value: "0".into(),
                    }],
                    dry_run: false,
                },
                pb::GateResult {
                    gate: "new-latency".into(),
                    point: "soak after wave 1 of step 1".into(),
                    verdict: "inconclusive".into(),
                    detail: "cannot ask the source".into(),
                    at: "2026-12-03T11:59:30Z".into(),
                    samples: Vec::new(),
                    dry_run: true,
                },
            ],
            ..Default::default()
        };
        let text = render_status(&job, None, Format::Table);
        assert!(
            text.contains(
                "health gates: checking soak after wave 1 of step 1, gate `ingress-errors` is failing"
            ),
            "{text}"
        );
        // the verdict, not "failing", when the gate could not tell (the dry-run one never holds)
        job.gates[0].verdict = "inconclusive".into();
        assert_eq!(
            soak_countdown(&job, now),
            ", gate `ingress-errors` is inconclusive (medea could not tell)"
        );
        job.gates[0].verdict = "fail".into();
        assert!(text.contains("ingress-errors"), "{text}");
        assert!(text.contains("{ingress=web} 0"), "{text}");
        assert!(text.contains("inconclusive (dry run)"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render_status(&job, None, Format::Json)).unwrap();
        assert_eq!(json["gates"][0]["verdict"], "fail", "{json}");
        assert_eq!(json["gates"][1]["verdict"], "inconclusive", "{json}");
        assert_eq!(json["gates"][1]["dryRun"], true, "{json}");
        assert_eq!(json["gatePoint"], "soak after wave 1 of step 1", "{json}");
    }

    /// Issue #36: the status compares elapsed with the plan's prediction and says when the job
    /// is past its pessimistic bound. Issue #51: elapsed is the job's clock, which does not run
    /// before the first command nor while the job waits for a window.
    #[test]
    fn status_compares_elapsed_with_the_prediction() {
        let mut job = pb::Rollout {
            created_at: "2026-12-03T12:00:00Z".into(),
            started_at: "2026-12-03T12:00:00Z".into(),
            active_seconds: 1200,
            predicted_median_seconds: 600,
            predicted_pessimistic_seconds: 900,
            ..Default::default()
        };
        assert_eq!(
            duration_line(&job).unwrap(),
            "duration: elapsed 20m00s, predicted median 10m00s, pessimistic 15m00s: past the pessimistic bound\n"
        );
        job.ended_at = "2026-12-03T12:12:00Z".into();
        job.active_seconds = 720;
        assert_eq!(
            duration_line(&job).unwrap(),
            "duration: elapsed 12m00s, predicted median 10m00s, pessimistic 15m00s\n"
        );
        job.predicted_pessimistic_seconds = 0;
        assert_eq!(duration_line(&job), None, "no prediction, no line");
    }

    /// Issue #51: a job approved days before its window reads as waiting, never as late.
    #[test]
    fn status_of_a_job_waiting_for_its_window_says_waiting_not_late() {
        let mut job = pb::Rollout {
            created_at: "2026-11-30T09:00:00Z".into(),
            predicted_median_seconds: 600,
            predicted_pessimistic_seconds: 900,
            ..Default::default()
        };
        let line = duration_line(&job).unwrap();
        assert!(line.starts_with("duration: not started"), "{line}");
        assert!(!line.contains("past the pessimistic bound"), "{line}");
        job.started_at = "2026-12-05T02:00:00Z".into();
        job.active_seconds = 300;
        job.paused_since = "2026-12-05T02:05:00Z".into();
        let line = duration_line(&job).unwrap();
        assert_eq!(
            line,
            "duration: elapsed 5m00s, predicted median 10m00s, pessimistic 15m00s; waiting for a maintenance window or exclusion since 2026-12-05T02:05:00Z: the clock stands still\n"
        );
    }

    /// Issue #36: a (halted) job's status lists its nodes installed ahead and not rebooted, and
    /// what their next boot does.
    #[test]
    fn status_lists_staged_nodes_and_what_their_next_boot_does() {
        let node = |name: &str, state: &str| pb::NodeProgress {
            node: name.into(),
            pool: "workers".into(),
            step: "1".into(),
            state: state.into(),
        };
        let job = pb::Rollout {
            job_id: "abc-prod".into(),
            state: "halted".into(),
            halt_reason: "staged node `w-2` was rebooted outside medea: …".into(),
            nodes: vec![
                node("w-1", "pending, staged: any reboot boots v1.13.9"),
                node("w-2", "pending"),
                node("w-3", "done"),
            ],
            ..Default::default()
        };
        let out = render_status(&job, None, Format::Table);
        assert!(
            out.contains(
                "installed ahead, not rebooted yet (1; to undo one before it reboots: talosctl rollback):\n  w-1: its next boot, planned or not, boots v1.13.9\n"
            ),
            "{out}"
        );
        assert!(!out.contains("w-2: its next boot"), "{out}");
        let plain = pb::Rollout {
            nodes: vec![node("w-2", "pending")],
            ..Default::default()
        };
        assert!(!render_status(&plain, None, Format::Table).contains("installed ahead"));
    }
    /// Issue #52 item 2: a resumed two-hop job counts node upgrades (one per node per step) on
    /// both sides of "n/m", so its last upgrade reads 5/5, not "3/5 nodes" three times.
    #[test]
    fn journal_lines_count_node_upgrades_across_hops() {
        let job = pb::Rollout {
            job_id: "abc-home".into(),
            cluster: "home".into(),
            state: "running".into(),
            nodes_total: 5,
            nodes: ["w-1", "w-2", "w-3"]
                .iter()
                .map(|n| pb::NodeProgress {
                    node: (*n).into(),
                    pool: "workers".into(),
                    step: "1".into(),
                    state: "pending".into(),
                })
                .collect(),
            ..Default::default()
        };
        let back = |step: u32, node: &str, to: &str| pb::RolloutEvent {
            job_id: "abc-home".into(),
            cluster: "home".into(),
            state: "progress".into(),
            message: format!("{node}: back on {to}, healthy and Ready"),
            at: "2026-12-03T12:03:00Z".into(),
            step_number: step,
            steps_total: 2,
            ..Default::default()
        };
        let mut lines = EventLines::new(jiff::tz::TimeZone::UTC);
        let out: Vec<String> = [
            back(1, "w-2", "v1.12.11"),
            back(1, "w-3", "v1.12.11"),
            back(2, "w-1", "v1.13.9"),
            back(2, "w-2", "v1.13.9"),
            back(2, "w-3", "v1.13.9"),
        ]
        .iter()
        .filter_map(|e| lines.line(e, &job))
        .collect();
        assert_eq!(out.len(), 5, "{out:?}");
        assert!(
            out[1].ends_with("upgraded to v1.12.11, Ready (2/5 node upgrades, step 1/2)"),
            "{out:?}"
        );
        assert!(
            out[4].ends_with("upgraded to v1.13.9, Ready (5/5 node upgrades, step 2/2)"),
            "{out:?}"
        );
    }
}
