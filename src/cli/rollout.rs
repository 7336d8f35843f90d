//! `medea rollout list|status|halt`: follow and stop rollout jobs on a running server.

use std::io::IsTerminal;

use clap::{Args, Subcommand};

use super::client::{ClientArgs, rpc_error};
use super::exit;
use super::output::{self, Format};
use crate::server::api::pb;

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
        #[arg(long)]
        cluster: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// The newest job of a cluster, node by node; with -w, follow it live until it ends.
    #[command(
        after_help = "Examples:\n  medea rollout status --cluster home\n  medea rollout status --cluster prod --pool workers -w\n\nWith -w the exit status is 0 when the job succeeds and 1 when it halts."
    )]
    Status {
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        pool: Option<String>,
        /// Follow the job until it succeeds or halts.
        #[arg(short = 'w', long)]
        watch: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Format,
    },
    /// Stop a job before its next mutating command. A halted job never continues by itself.
    #[command(
        after_help = "Examples:\n  medea rollout halt 1a2b3c4d5e6f-prod --reason 'latency spike on canary'"
    )]
    Halt {
        job: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

fn runtime() -> miette::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().map_err(|e| miette::miette!("cannot start the runtime: {e}"))
}

pub fn run(args: RolloutArgs) -> miette::Result<u8> {
    let addr = args.client.addr.clone();
    runtime()?.block_on(async move {
        let mut c = args.client.connect().await?;
        let rpc = |s| rpc_error(&addr, s);
        match args.action {
            RolloutAction::List { cluster, output: fmt } => {
                let r = c.list_rollouts(pb::ListRolloutsRequest { cluster: cluster.unwrap_or_default() }).await.map_err(rpc)?.into_inner();
                let text = match fmt {
                    Format::Json => output::json(&r.rollouts),
                    Format::Yaml => output::yaml(&r.rollouts),
                    Format::Table => output::table(
                        &["JOB", "CLUSTER", "PLAN", "STATE", "NODES", "CURRENT", "CREATED"],
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
                                    j.created_at.clone(),
                                ]
                            })
                            .collect::<Vec<_>>(),
                    ),
                };
                print!("{text}");
                Ok(exit::OK)
            }
            RolloutAction::Halt { job, reason } => {
                let r = c.halt_rollout(pb::HaltRolloutRequest { job_id: job.clone(), reason: reason.unwrap_or_default() }).await.map_err(rpc)?.into_inner();
                let state = r.rollout.map(|r| r.state).unwrap_or_default();
                println!("halt requested for {job} (state: {state}); it stops before its next mutating command");
                Ok(exit::OK)
            }
            RolloutAction::Status { cluster, pool, watch, output: fmt } => {
                let newest = |r: pb::ListRolloutsResponse| r.rollouts.into_iter().next();
                let Some(job) = newest(c.list_rollouts(pb::ListRolloutsRequest { cluster: cluster.clone() }).await.map_err(rpc)?.into_inner()) else {
                    println!("cluster {cluster} has no rollout jobs");
                    return Ok(exit::OK);
                };
                if !watch {
                    print!("{}", render_status(&job, pool.as_deref(), fmt));
                    return Ok(if job.state == "halted" { exit::ERROR } else { exit::OK });
                }
                follow(&mut c, &addr, job, pool.as_deref()).await
            }
        }
    })
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
        Format::Table => {
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
            s
        }
    }
}

/// Follow a job: progress bars per node on a TTY, one line per event otherwise.
pub(crate) async fn follow(
    c: &mut super::client::Client,
    addr: &str,
    job: pb::Rollout,
    pool: Option<&str>,
) -> miette::Result<u8> {
    let tty = std::io::stdout().is_terminal();
    let mut events = c
        .watch_rollout(pb::WatchRolloutRequest {
            job_id: job.job_id.clone(),
            cluster: String::new(),
        })
        .await
        .map_err(|s| rpc_error(addr, s))?
        .into_inner();
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
            print!("{}", render_status(&current, pool, Format::Table));
            return Ok(if current.state == "succeeded" {
                exit::OK
            } else {
                exit::ERROR
            });
        }
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), events.message()).await;
        match next {
            Ok(Ok(Some(e))) if !tty => {
                println!(
                    "{} {} {} {} {}",
                    e.at,
                    if e.node.is_empty() { "-" } else { &e.node },
                    if e.step.is_empty() { "-" } else { &e.step },
                    e.state,
                    e.message
                );
            }
            Ok(Ok(Some(_))) | Err(_) => {}
            Ok(Ok(None)) => return Err(miette::miette!("the server closed the event stream")),
            Ok(Err(s)) => return Err(rpc_error(addr, s)),
        }
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
    }
}
