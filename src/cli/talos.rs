//! `medea talos …`: a minimal talosctl-like diagnostic surface over medea's own Talos client, to
//! check connectivity and credentials before trusting medea with a rollout.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use miette::{IntoDiagnostic as _, WrapErr as _, miette};
use serde::Serialize;

use super::exit;
use crate::talos::config::default_talosconfig_path;
use crate::talos::{
    ClientSettings, EtcdMember, HealthCheckSpec, NodeTarget, ServiceHealth, TalosApi as _,
    TalosClient,
};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable tables, like talosctl.
    Text,
    /// JSON, one document.
    Json,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  medea talos version --talosconfig ./talosconfig --node 127.5.0.2\n  medea talos services -n 127.5.0.2,127.5.0.3\n  medea talos etcd-members -n 127.5.0.2 -o json\n  medea talos etcd-snapshot ./etcd.snapshot -n 127.5.0.2\n  medea talos health -n 127.5.0.2 --wait-timeout 2m"
)]
pub struct TalosArgs {
    /// talosconfig to use (default: $TALOSCONFIG, then $TALOS_HOME/config, then ~/.talos/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub talosconfig: Option<PathBuf>,
    /// Context to use instead of the talosconfig's current one.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Target node(s), sent as the `node` metadata (repeat or comma-separate; default: the
    /// context's `nodes`).
    #[arg(
        short = 'n',
        long = "node",
        global = true,
        value_delimiter = ',',
        value_name = "NODE"
    )]
    pub nodes: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    #[command(subcommand)]
    pub command: TalosCommand,
}

#[derive(Debug, Subcommand)]
pub enum TalosCommand {
    /// Show the Talos version each node runs.
    Version,
    /// List each node's services and their health.
    Services,
    /// List the etcd members as a control-plane node sees them.
    EtcdMembers,
    /// Stream an etcd snapshot from one control-plane node to a new file (fsynced, verified).
    EtcdSnapshot {
        /// Where to write the snapshot (must not exist).
        path: PathBuf,
    },
    /// Run the server-side cluster health check on one control-plane node.
    Health {
        /// How long the node may wait for the cluster to become healthy (`30s`, `20m`).
        #[arg(long, default_value = "20m", value_parser = crate::duration::parse_std_lenient)]
        wait_timeout: Duration,
        /// Control-plane node addresses (default: discovered by the node).
        #[arg(long, value_delimiter = ',')]
        control_plane_nodes: Vec<String>,
        /// Worker node addresses (default: discovered by the node).
        #[arg(long, value_delimiter = ',')]
        worker_nodes: Vec<String>,
    },
}

pub fn run(args: TalosArgs) -> miette::Result<u8> {
    let path = match args.talosconfig.clone().or_else(default_talosconfig_path) {
        Some(p) => p,
        None => {
            return Err(miette!(
                help = "pass --talosconfig FILE or set TALOSCONFIG",
                "no talosconfig found"
            ));
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .into_diagnostic()
        .wrap_err("failed to start the async runtime")?;
    // The client's channels need the runtime (lazy connections spawn on it).
    let _guard = rt.enter();
    let (client, ctx) =
        TalosClient::from_talosconfig(&path, args.context.as_deref(), ClientSettings::default())
            .into_diagnostic()?;
    let raw_nodes = if args.nodes.is_empty() {
        ctx.nodes.clone()
    } else {
        args.nodes.clone()
    };
    if raw_nodes.is_empty() {
        return Err(miette!(
            help = "pass --node ADDRESS, or add `nodes:` to the talosconfig context",
            "no target node: the context `{}` has no `nodes`",
            ctx.name
        ));
    }
    let nodes = raw_nodes
        .iter()
        .map(|n| NodeTarget::parse(n))
        .collect::<Result<Vec<_>, _>>()
        .into_diagnostic()?;
    rt.block_on(dispatch(&client, &nodes, args.output, args.command))
}

fn one_node<'a>(nodes: &'a [NodeTarget], what: &str) -> miette::Result<&'a NodeTarget> {
    match nodes {
        [n] => Ok(n),
        _ => Err(miette!(
            help = "pass exactly one --node",
            "`{what}` runs against one node, {} given",
            nodes.len()
        )),
    }
}

fn print_json<T: Serialize>(v: &T) -> miette::Result<()> {
    let s = serde_json::to_string_pretty(v).into_diagnostic()?;
    outln!("{s}");
    Ok(())
}

/// Align columns like Go's tabwriter with padding 3 (talosctl's tables).
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}", w = widths[i] + 3));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn ago(unix: Option<i64>) -> String {
    let Some(t) = unix else { return String::new() };
    let secs = (jiff::Timestamp::now().as_second() - t).max(0);
    match secs {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m{}s ago", s / 60, s % 60),
        s => format!("{}h{}m ago", s / 3600, (s % 3600) / 60),
    }
}

async fn dispatch(
    client: &TalosClient,
    nodes: &[NodeTarget],
    output: Output,
    command: TalosCommand,
) -> miette::Result<u8> {
    match command {
        TalosCommand::Version => {
            let mut all = Vec::new();
            for n in nodes {
                all.push(client.version(n).await.into_diagnostic()?);
            }
            if output == Output::Json {
                print_json(&all)?;
            } else {
                let mut out = String::new();
                for v in &all {
                    out.push_str(&format!(
                        "Server:\n\tNODE:        {}\n\tTag:         {}\n\tSHA:         {}\n\tBuilt:       {}\n\tGo version:  {}\n\tOS/Arch:     {}/{}\n\tEnabled:     {}\n",
                        v.node,
                        v.tag,
                        v.sha,
                        v.built,
                        v.go_version,
                        v.os,
                        v.arch,
                        if v.rbac { "RBAC" } else { "" }
                    ));
                }
                out!("{out}");
            }
        }
        TalosCommand::Services => {
            #[derive(Serialize)]
            struct NodeServices {
                node: NodeTarget,
                services: Vec<ServiceHealth>,
            }
            let mut all = Vec::new();
            for n in nodes {
                all.push(NodeServices {
                    node: n.clone(),
                    services: client.services(n).await.into_diagnostic()?,
                });
            }
            if output == Output::Json {
                print_json(&all)?;
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .flat_map(|ns| {
                        ns.services.iter().map(|s| {
                            vec![
                                ns.node.to_string(),
                                s.id.clone(),
                                s.state.clone(),
                                match s.health {
                                    crate::talos::Health::Healthy => "OK".to_string(),
                                    crate::talos::Health::Unhealthy => "Fail".to_string(),
                                    crate::talos::Health::Unknown => "?".to_string(),
                                },
                                ago(s.last_change_unix),
                                s.last_event.clone().unwrap_or_default(),
                            ]
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    table(
                        &[
                            "NODE",
                            "SERVICE",
                            "STATE",
                            "HEALTH",
                            "LAST CHANGE",
                            "LAST EVENT"
                        ],
                        &rows
                    )
                );
            }
        }
        TalosCommand::EtcdMembers => {
            #[derive(Serialize)]
            struct NodeMembers {
                node: NodeTarget,
                members: Vec<EtcdMember>,
            }
            let mut all = Vec::new();
            for n in nodes {
                all.push(NodeMembers {
                    node: n.clone(),
                    members: client.etcd_members(n).await.into_diagnostic()?,
                });
            }
            if output == Output::Json {
                print_json(&all)?;
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .flat_map(|nm| {
                        nm.members.iter().map(|m| {
                            vec![
                                nm.node.to_string(),
                                format!("{:016x}", m.id),
                                m.hostname.clone(),
                                m.peer_urls.join(","),
                                m.client_urls.join(","),
                                m.is_learner.to_string(),
                            ]
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    table(
                        &[
                            "NODE",
                            "ID",
                            "HOSTNAME",
                            "PEER URLS",
                            "CLIENT URLS",
                            "LEARNER"
                        ],
                        &rows
                    )
                );
            }
        }
        TalosCommand::EtcdSnapshot { path } => {
            let n = one_node(nodes, "etcd-snapshot")?;
            let info = client.etcd_snapshot(n, &path).await.into_diagnostic()?;
            if output == Output::Json {
                print_json(&info)?;
            } else {
                outln!(
                    "etcd snapshot saved to {:?} ({} bytes)\nsha256: {}",
                    info.path,
                    info.size,
                    info.sha256
                );
            }
        }
        TalosCommand::Health {
            wait_timeout,
            control_plane_nodes,
            worker_nodes,
        } => {
            let n = one_node(nodes, "health")?;
            let spec = HealthCheckSpec {
                wait_timeout,
                control_plane_nodes,
                worker_nodes,
            };
            let text = output == Output::Text;
            let report = client
                .health_check_with_progress(n, &spec, |line| {
                    if text {
                        outln!("{line}");
                        let _ = std::io::stdout().flush();
                    }
                })
                .await
                .into_diagnostic()?;
            if !text {
                print_json(&report)?;
            }
        }
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_like_tabwriter() {
        let t = table(
            &["NODE", "SERVICE"],
            &[
                vec!["127.5.0.2".into(), "apid".into()],
                vec!["cp-1".into(), "etcd".into()],
            ],
        );
        assert_eq!(
            t,
            "NODE        SERVICE\n127.5.0.2   apid\ncp-1        etcd\n"
        );
    }
}
